//! What a program costs. Read off the program (modelled): FLOPs, memory, random bits,
//! collectives and op categories; the cost model that prices a per-device program op by op
//! on a device profile (calibrated `this`, or a preset such as TPU v4 or H100) with its
//! collectives over the mesh topology; the step as a timeline per device, modelled (with
//! asynchronous collectives overlapping compute) or measured, and as Chrome trace-event JSON;
//! and the microbenchmarks that calibrate `this`.
mod balance;
mod bubble;
mod calibrate;
mod collective;
mod compare;
mod cost;
mod device;
mod estimate;
mod expert_load;
mod fit;
mod floor;
mod measured;
mod predict;
mod price;
mod schedule;
mod summary;
mod timeline;
mod topology;
mod trace;
mod work;

pub use balance::{attention_balance, AttentionBalance};
pub use bubble::{measured_bubble, pipeline_bubble, MeasuredBubble, PipelineBubble};
pub use calibrate::{
    calibrate, calibrate_quick, calibrate_with, Budget, Calibration, CalibrationPrograms, Measurement, NOISY_SPREAD,
};
pub use collective::CollectiveKind;
pub use compare::{compare_ops, OpComparison, OpGroup};
pub use cost::{attention_pairs, category, instr_flops, Category};
pub use device::{
    a100, device_preset, figure_label, h100, m2_max, presets, rtx4090, tpu_v4, tpu_v5e, DeviceProfile, MatmulFit,
    ScaleOut, Topology,
};
pub use estimate::{estimate_step, StepEstimate};
pub use expert_load::{expert_shares, measured_imbalance, Routing};
pub use floor::{profiled_floor, step_floor, Roofline, StepFloor};
pub use measured::{breakdown, measured_timeline, MeasuredBreakdown, OpRow, PHASES, SUBMIT};
pub use predict::{
    model_step, predict, CollectiveCost, DeviceBytes, Prediction, BUBBLE, COMMUNICATION, COMPUTE, MEMORY,
};
pub use price::{matmul_efficiency, matmul_fit, price_ops, work_seconds, work_split, OpPrice, LAUNCH};
pub use schedule::{schedule, ScheduleError};
pub use summary::{summarize, CollectiveUse, KindTotals, ProgramSummary};
pub use timeline::{
    mesh_label, spmd_work, DeviceTimeline, DeviceWork, Exchange, Span, SpanKind, StepWork, Task, Timeline, IDLE,
};
pub use topology::{collective_time, collective_time_on, AxisPlace, CollectiveTime, MeshLayout, PLACEMENT};
pub use trace::{OpSource, Trace};
pub use work::{program_work, DotShape, Placement, Work, THREEFRY_INT_OPS};
