//! Explicit sharding (JAX's `AxisType.Explicit` mesh axes): the global program typed op by op,
//! every value's type carrying its sharding (`f32[8@dp,128]`), with JAX 0.10's sharding rules
//! ([`rules`]); where a rule is ambiguous or conflicting JAX raises at trace time and names the
//! fix (`out_sharding=`, `reshard`, `auto_axes`), and so does [`annotate`], unless the caller
//! wants a type there, which it then writes as a JAX user writes it. The typed program runs as
//! jit with every value laid out as its type says ([`lower`]).
mod annotate;
mod error;
mod lower;
pub mod rules;
mod types;
mod view;

pub use annotate::{annotate, Annotated, Choice, ChoiceKind, Want, WantDims};
pub use error::{Fix, ShardingTypeError};
pub use lower::lower;
pub use rules::{accepts_out_sharding, infer, FixKind, RuleError, Typed};
pub use types::{explicit_only, type_text, Dims};
pub use view::{bits_sites, typed_lines, BitsSite, TypedLine};
