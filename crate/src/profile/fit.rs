//! The calibration's fits: pure functions of timings, so their behaviour under noise is tested
//! without a GPU. The launch fit is robust to a few timings a burst of load slowed down.

/// One reference step: the model's work in seconds, its launches, and its measured seconds less
/// the fixed per-step cost.
pub type StepRow = (f64, f64, f64);

/// A rate is read off a microbenchmark only when its work outweighs its fixed costs (its
/// launches and its submission) this many times. On a fast GPU the arrays sized for CPU
/// adapters take microseconds, less than one launch, and the rates read off them came out 7x
/// (bandwidth) to 10^17x (matmuls) too high on an H200 (2026-12-04).
pub const WORK_BOUND: f64 = 4.0;

/// By what power of two a microbenchmark must grow for its work (seconds at its present size)
/// to outweigh its fixed costs (seconds) [`WORK_BOUND`] times: 1 where it already does. Work
/// the timer cannot tell from its fixed costs (1/64 of them or less, or negative after noise)
/// counts as 1/64 of them, so one probe grows a program at most 256x.
pub fn growth_to_work_bound(work_s: f64, fixed_s: f64) -> usize {
    if fixed_s.is_nan() || fixed_s <= 0.0 || work_s >= WORK_BOUND * fixed_s {
        return 1;
    }
    let need = WORK_BOUND * fixed_s / work_s.max(fixed_s / 64.0);
    (need.ceil() as usize).next_power_of_two().clamp(2, 256)
}

/// |predicted - measured| / measured of one row under `launch_s` (work at its own price).
fn relative_residual(&(w, l, t): &StepRow, launch_s: f64) -> f64 {
    (w + launch_s * l - t).abs() / t.abs().max(1e-30)
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The launch fit's result: what a launch costs inside a train step, and which rows it trusted.
#[derive(Clone, Debug, PartialEq)]
pub struct LaunchFit {
    pub launch_s: f64,
    /// Per row: whether it was left out as an outlier.
    pub outlier: Vec<bool>,
}

/// What a launch costs inside a whole train step, from small reference steps: each row gives
/// its time less its work (priced at the microbenchmarks' rates) over its launches. Their
/// median picks the inliers (within 3x the median relative residual, and at least 5%), whose
/// median is the fit, never below `chain_launch_s`, what a launch costs in a chain of one kernel
/// (a step switches pipelines and bindings between dependent dispatches: 30 us a launch in a
/// step on an H200, 5 us in the chain). The work itself is not scaled: a scale fitted to whole
/// steps took up the small steps' mispriced ops and overpriced every larger step (+32-89% on
/// the seed preset's size on lavapipe, 2026-12-04).
pub fn fit_launch(rows: &[StepRow], chain_launch_s: f64) -> LaunchFit {
    let per_launch = |rows: &mut dyn Iterator<Item = &StepRow>| {
        median(rows.filter(|r| r.1 > 0.0).map(|&(w, l, t)| (t - w) / l).collect())
    };
    let first = per_launch(&mut rows.iter());
    if first.is_nan() || first <= 0.0 {
        return LaunchFit {
            launch_s: chain_launch_s,
            outlier: vec![false; rows.len()],
        };
    }
    let cut = (3.0 * median(rows.iter().map(|r| relative_residual(r, first)).collect())).max(0.05);
    let outlier: Vec<bool> = rows.iter().map(|r| relative_residual(r, first) > cut).collect();
    let inliers = per_launch(&mut rows.iter().zip(&outlier).filter(|(_, &o)| !o).map(|(r, _)| r));
    let fitted = if inliers > 0.0 { inliers } else { first };
    LaunchFit {
        launch_s: fitted.max(chain_launch_s),
        outlier,
    }
}

/// How far a program's timed runs spread: the interquartile range over the median (nearest-rank
/// quartiles; 0 for fewer than 3 runs). One run a burst slowed moves it little; a machine
/// busy through the rounds moves it much.
pub fn relative_spread(runs: &[f64]) -> f64 {
    if runs.len() < 3 {
        return 0.0;
    }
    let mut v = runs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| v[((q * (v.len() - 1) as f64).round() as usize).min(v.len() - 1)];
    let mid = at(0.5);
    if mid <= 0.0 {
        return 0.0;
    }
    (at(0.75) - at(0.25)) / mid
}

/// A calibration's spread: the 75th percentile of its programs' spreads, so that a quarter of
/// its programs spread at least this much.
pub fn calibration_spread(spreads: &[f64]) -> f64 {
    if spreads.is_empty() {
        return 0.0;
    }
    let mut v = spreads.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v[((0.75 * (v.len() - 1) as f64).round() as usize).min(v.len() - 1)]
}

/// Least squares of seconds = flops / peak + fixed (the fixed start-up cost of a matmul
/// kernel beyond its launch), from (flops, seconds) pairs. Returns the peak and the size at
/// which a matmul reaches half of it (fixed x peak), the profile's form.
pub fn fit_matmul(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    let (mx, my) = (
        points.iter().map(|p| p.0).sum::<f64>() / n,
        points.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    let fixed = my - slope * mx;
    let best = points.iter().map(|&(f, s)| f / s).fold(0.0, f64::max);
    if slope <= 0.0 {
        return (best, 0.0);
    }
    let peak = 1.0 / slope;
    (peak, fixed.max(0.0) * peak)
}

/// Least squares of seconds = x . coefficients, each row weighted by 1/seconds (so each shape
/// counts by its relative error), with no coefficient below 0: a negative one is dropped and
/// the rest fitted again.
pub fn fit_nonnegative(rows: &[([f64; 3], f64)]) -> [f64; 3] {
    let mut active = [true; 3];
    loop {
        let idx: Vec<usize> = (0..3).filter(|&i| active[i]).collect();
        let n = idx.len();
        // Normal equations of the active columns.
        let mut a = vec![vec![0.0; n + 1]; n];
        for (x, s) in rows {
            let w = 1.0 / (s * s).max(1e-30);
            for (r, &i) in idx.iter().enumerate() {
                for (c, &j) in idx.iter().enumerate() {
                    a[r][c] += w * x[i] * x[j];
                }
                a[r][n] += w * x[i] * s;
            }
        }
        // Gauss-Jordan with partial pivoting.
        for col in 0..n {
            let piv = (col..n)
                .max_by(|&p, &q| a[p][col].abs().total_cmp(&a[q][col].abs()))
                .unwrap_or(col);
            a.swap(col, piv);
            let d = a[col][col];
            if d.abs() < 1e-300 {
                continue;
            }
            for v in &mut a[col][col..=n] {
                *v /= d;
            }
            let pivot = a[col].clone();
            for (r, row) in a.iter_mut().enumerate() {
                if r != col {
                    let f = row[col];
                    for (x, p) in row[col..=n].iter_mut().zip(&pivot[col..=n]) {
                        *x -= f * p;
                    }
                }
            }
        }
        let mut out = [0.0; 3];
        for (r, &i) in idx.iter().enumerate() {
            out[i] = a[r][n];
        }
        match idx.iter().copied().find(|&i| out[i] < 0.0) {
            Some(i) if n > 1 => active[i] = false,
            _ => return out.map(|v| v.max(0.0)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Five launch-bound reference steps at 30 us a launch inside a step: work is a fraction
    /// of each.
    fn steps() -> Vec<StepRow> {
        [(2e-4, 60.0), (4e-4, 110.0), (8e-4, 70.0), (2e-4, 130.0), (1e-3, 150.0)]
            .iter()
            .map(|&(w, l)| (w, l, w + l * 30e-6))
            .collect()
    }

    #[test]
    fn launch_fit_recovers_the_launch_cost_inside_a_step() {
        let fit = fit_launch(&steps(), 5e-6);
        assert!((fit.launch_s / 30e-6 - 1.0).abs() < 1e-9, "{fit:?}");
        assert!(fit.outlier.iter().all(|&o| !o));
    }

    #[test]
    fn steps_a_burst_slowed_are_left_out_of_the_launch_fit() {
        // One step 2x slow (a burst of load during its runs): the fit is that of the others.
        let mut rows = steps();
        rows[1].2 *= 2.0;
        let fit = fit_launch(&rows, 5e-6);
        assert!((fit.launch_s / 30e-6 - 1.0).abs() < 1e-9, "{fit:?}");
        assert_eq!(fit.outlier, [false, true, false, false, false]);
    }

    #[test]
    fn a_launch_in_a_step_costs_at_least_one_in_a_chain() {
        // Steps that ran faster than their work plus chained launches (noise, or work priced
        // high): the chain's launch cost stands.
        assert_eq!(fit_launch(&steps(), 50e-6).launch_s, 50e-6);
        let faster: Vec<StepRow> = steps().into_iter().map(|(w, l, t)| (w, l, 0.5 * t)).collect();
        assert_eq!(fit_launch(&faster, 50e-6).launch_s, 50e-6);
        // No step gives a positive launch cost: the chain's.
        assert_eq!(fit_launch(&[(0.01, 100.0, 0.005)], 5e-6).launch_s, 5e-6);
        assert_eq!(fit_launch(&[], 5e-6).launch_s, 5e-6);
    }

    #[test]
    fn a_microbenchmark_grows_until_its_work_outweighs_its_fixed_costs() {
        // Already work-bound: stays.
        assert_eq!(growth_to_work_bound(4e-3, 1e-3), 1);
        // Half of what it needs: twice the size.
        assert_eq!(growth_to_work_bound(2e-3, 1e-3), 2);
        // 5% of the fixed costs needs 80x: the next power of two.
        assert_eq!(growth_to_work_bound(5e-5, 1e-3), 128);
        // Below the timer's reach, or negative after noise: the largest step a probe takes.
        assert_eq!(growth_to_work_bound(-1e-6, 1e-3), 256);
        assert_eq!(growth_to_work_bound(0.0, 1e-3), 256);
        // No fixed cost measured: nothing to outweigh.
        assert_eq!(growth_to_work_bound(1e-9, 0.0), 1);
        assert_eq!(growth_to_work_bound(1e-9, f64::NAN), 1);
    }

    #[test]
    fn spread_ignores_one_slow_round_and_grows_with_a_busy_machine() {
        // Five rounds, one slowed 3x by a burst: the quartiles leave it out.
        assert!(relative_spread(&[10.0, 10.2, 30.0, 9.9, 10.1]) < 0.05);
        // Rounds all over the place: the machine was busy throughout.
        assert!(relative_spread(&[10.0, 14.0, 19.0, 9.0, 25.0]) > 0.3);
        assert_eq!(relative_spread(&[1.0, 2.0]), 0.0);
        // A quarter of the programs noisy is enough to call the calibration so.
        let spreads = [0.01, 0.02, 0.01, 0.3, 0.02, 0.4, 0.25, 0.01];
        assert!(calibration_spread(&spreads) >= 0.25);
        assert!(calibration_spread(&[0.01, 0.02, 0.03, 0.5]) < 0.1);
    }

    #[test]
    fn batched_fit_recovers_per_flop_per_product_and_fixed_costs() {
        let truth = [1.0 / 3e9, 1e-4, 2e-3];
        let rows: Vec<([f64; 3], f64)> = [
            (2.1e6, 64.0),
            (2.1e6, 64.0 * 2.0),
            (2.6e5, 8.0),
            (4.2e6, 8.0),
            (1.68e7, 2.0),
        ]
        .iter()
        .map(|&(f, p)| {
            let x = [f, p, 1.0];
            (x, x.iter().zip(&truth).map(|(a, b)| a * b).sum())
        })
        .collect();
        let got = fit_nonnegative(&rows);
        for (g, t) in got.iter().zip(&truth) {
            assert!((g / t - 1.0).abs() < 1e-6, "{got:?}");
        }
    }

    #[test]
    fn matmul_fit_recovers_peak_and_half_size() {
        let (peak, half) = (10e9, 4e6);
        let points: Vec<(f64, f64)> = [1e6, 4e6, 16e6, 64e6]
            .iter()
            .map(|&f| (f, f / (peak * f / (f + half))))
            .collect();
        let (p, h) = fit_matmul(&points);
        assert!((p / peak - 1.0).abs() < 1e-6, "{p}");
        assert!((h / half - 1.0).abs() < 1e-6, "{h}");
    }
}
