/// Milliseconds from an arbitrary origin: `Instant` natively, `performance.now()` on the web
/// (where `Instant` panics).
pub fn now_ms() -> f64 {
    #[cfg(target_arch = "wasm32")]
    {
        web_sys::window()
            .and_then(|w| w.performance())
            .map(|p| p.now())
            .unwrap_or(0.0)
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        use std::sync::OnceLock;
        use std::time::Instant;
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        ORIGIN.get_or_init(Instant::now).elapsed().as_secs_f64() * 1e3
    }
}

/// GPU time of each dispatch of one `run_timed`, in milliseconds, read from timestamp queries.
#[derive(Debug, Clone, Default)]
pub struct DispatchTimes {
    /// (dispatch label, milliseconds), in submission order.
    pub per_dispatch: Vec<(String, f64)>,
}

impl DispatchTimes {
    pub fn total_ms(&self) -> f64 {
        self.per_dispatch.iter().map(|(_, t)| t).sum()
    }
}
