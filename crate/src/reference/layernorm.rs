//! LayerNorm over the last axis (MODEL.md): eps 1e-5, biased variance.

const EPS: f32 = 1e-5;

/// x (rows, C), gamma and beta (C) -> (out (rows, C), mean (rows), rstd (rows)).
pub fn forward(x: &[f32], gamma: &[f32], beta: &[f32], rows: usize, c: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut out = vec![0.0; rows * c];
    let mut mean = vec![0.0; rows];
    let mut rstd = vec![0.0; rows];
    for r in 0..rows {
        let xr = &x[r * c..(r + 1) * c];
        let m = xr.iter().sum::<f32>() / c as f32;
        let var = xr.iter().map(|&v| (v - m) * (v - m)).sum::<f32>() / c as f32;
        let rs = 1.0 / (var + EPS).sqrt();
        for j in 0..c {
            out[r * c + j] = (xr[j] - m) * rs * gamma[j] + beta[j];
        }
        mean[r] = m;
        rstd[r] = rs;
    }
    (out, mean, rstd)
}

/// dout (rows, C) and the forward's x, mean, rstd, gamma -> (dx (rows, C), dgamma (C), dbeta (C)).
pub fn backward(
    dout: &[f32],
    x: &[f32],
    mean: &[f32],
    rstd: &[f32],
    gamma: &[f32],
    rows: usize,
    c: usize,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut dx = vec![0.0; rows * c];
    let mut dgamma = vec![0.0; c];
    let mut dbeta = vec![0.0; c];
    for r in 0..rows {
        let xhat = |j: usize| (x[r * c + j] - mean[r]) * rstd[r];
        let dnorm = |j: usize| dout[r * c + j] * gamma[j];
        // dx = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat))
        let a = (0..c).map(dnorm).sum::<f32>() / c as f32;
        let b = (0..c).map(|j| dnorm(j) * xhat(j)).sum::<f32>() / c as f32;
        for j in 0..c {
            dx[r * c + j] = rstd[r] * (dnorm(j) - a - xhat(j) * b);
            dgamma[j] += dout[r * c + j] * xhat(j);
            dbeta[j] += dout[r * c + j];
        }
    }
    (dx, dgamma, dbeta)
}
