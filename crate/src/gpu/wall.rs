//! Wall-clock timing of submissions: what a profile uses where timestamp queries are missing
//! or implausible (lavapipe and SwiftShader report pass times far below the wall time).
use super::{now_ms, Dispatch, GpuContext, GpuError};

impl GpuContext {
    /// Wall time of `dispatches` submitted in one pass on their own and awaited, in ms.
    /// Includes one submission's overhead ([`GpuContext::submit_overhead_ms`]).
    pub async fn run_awaited_ms(&self, dispatches: &[Dispatch]) -> Result<f64, GpuError> {
        self.run_repeated_awaited_ms(dispatches, 1).await
    }

    /// Wall time of `dispatches` encoded `times` times over in one pass, submitted alone and
    /// awaited, in ms: the difference between two and one copies is their cost without the
    /// submission's.
    pub async fn run_repeated_awaited_ms(&self, dispatches: &[Dispatch], times: usize) -> Result<f64, GpuError> {
        self.finish().await?;
        let t0 = now_ms();
        let mut encoder = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("shardlab timed submission"),
        });
        let repeated = (0..times).flat_map(|_| dispatches.iter());
        super::encode_all(&mut encoder, repeated, "shardlab timed dispatches");
        self.queue.submit([encoder.finish()]);
        self.finish().await?;
        Ok(now_ms() - t0)
    }

    /// Wall time of one empty submission (an empty compute pass) awaited, median of `reps`:
    /// what every split submission pays on top of its dispatches.
    pub async fn submit_overhead_ms(&self, reps: usize) -> Result<f64, GpuError> {
        let mut t = Vec::with_capacity(reps.max(1));
        for _ in 0..reps.max(1) {
            t.push(self.run_awaited_ms(&[]).await?);
        }
        Ok(median(t))
    }
}

/// The middle value (the upper one of an even count); 0 for none.
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}
