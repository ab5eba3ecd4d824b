//! Measurements behind `shardlab bench ...`: each returns plain structs (serializable); the CLI prints them.
pub mod compare;
pub mod kernels;
pub mod model;
pub mod peers;
pub mod published;
pub mod train;
