//! Meshes and shardings, named and behaving as in JAX: [`Mesh`], [`PartitionSpec`],
//! [`NamedSharding`] (shard shapes, the block each device holds), the mesh axes' types
//! ([`AxisType`]), the device groups of collectives, and the output shapes of the collectives.
//! Pure Rust: nothing here knows of GPUs.
mod axis_type;
mod collective;
mod error;
mod mesh;
mod named;
mod spec;

pub use axis_type::{AxisType, AxisTypes};
pub use collective::{all_gather_shape, all_to_all_shape, ppermute_sources, psum_scatter_shape};
pub use error::ShardingError;
pub use mesh::Mesh;
pub use named::NamedSharding;
pub use spec::PartitionSpec;
