//! The search's candidates are independent: natively they are screened and priced on every
//! core; in the browser (wasm32, one thread) in turn.

/// `f` of each item, in the items' order, on up to the machine's cores. Each worker takes the
/// next item as it finishes one, since candidates' costs differ by orders of magnitude (a
/// pipeline of many microbatches against one device).
pub fn map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        if cores > 1 && items.len() > 1 {
            let next = AtomicUsize::new(0);
            let work = || {
                let mut done = vec![];
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(item) = items.get(i) else { return done };
                    done.push((i, f(item)));
                }
            };
            let mut done: Vec<(usize, R)> = std::thread::scope(|scope| {
                let workers: Vec<_> = (0..cores.min(items.len())).map(|_| scope.spawn(work)).collect();
                workers
                    .into_iter()
                    .flat_map(|w| w.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
                    .collect()
            });
            done.sort_by_key(|&(i, _)| i);
            return done.into_iter().map(|(_, r)| r).collect();
        }
    }
    items.iter().map(f).collect()
}
