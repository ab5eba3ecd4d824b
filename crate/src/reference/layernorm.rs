//! LayerNorm over the last axis (MODEL.md): eps 1e-5, biased variance.

const EPS: f32 = 1e-5;

/// The shape of a layernorm on D devices: `rows` counts every device's rows (D * R), each row
/// has `c` columns, and device d normalises rows [d * R, (d + 1) * R) with its own gamma and
/// beta block. One device: `devices` = 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerNormShape {
    pub rows: usize,
    pub c: usize,
    pub devices: usize,
}

impl LayerNormShape {
    /// `rows` rows of `c` on one device.
    pub fn new(rows: usize, c: usize) -> Self {
        Self { rows, c, devices: 1 }
    }

    /// Rows of one device.
    fn rows_per_device(&self) -> usize {
        self.rows / self.devices.max(1)
    }
}

/// x (rows, C), gamma and beta (D, C) -> (out (rows, C), mean (rows), rstd (rows)).
pub fn forward(x: &[f32], gamma: &[f32], beta: &[f32], s: LayerNormShape) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (rows, c, rpd) = (s.rows, s.c, s.rows_per_device());
    let mut out = vec![0.0; rows * c];
    let mut mean = vec![0.0; rows];
    let mut rstd = vec![0.0; rows];
    for r in 0..rows {
        let d = r / rpd;
        let (gamma, beta) = (&gamma[d * c..(d + 1) * c], &beta[d * c..(d + 1) * c]);
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

/// dout (rows, C) and the forward's x, mean, rstd, gamma (D, C) -> (dx (rows, C), dgamma (D, C),
/// dbeta (D, C)), each device's dgamma and dbeta summing over its own rows.
pub fn backward(
    dout: &[f32],
    x: &[f32],
    mean: &[f32],
    rstd: &[f32],
    gamma: &[f32],
    s: LayerNormShape,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (rows, c, rpd) = (s.rows, s.c, s.rows_per_device());
    let mut dx = vec![0.0; rows * c];
    let mut dgamma = vec![0.0; s.devices * c];
    let mut dbeta = vec![0.0; s.devices * c];
    for r in 0..rows {
        let d = r / rpd;
        let gamma = &gamma[d * c..(d + 1) * c];
        let xhat = |j: usize| (x[r * c + j] - mean[r]) * rstd[r];
        let dnorm = |j: usize| dout[r * c + j] * gamma[j];
        // dx = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat))
        let a = (0..c).map(dnorm).sum::<f32>() / c as f32;
        let b = (0..c).map(|j| dnorm(j) * xhat(j)).sum::<f32>() / c as f32;
        for j in 0..c {
            dx[r * c + j] = rstd[r] * (dnorm(j) - a - xhat(j) * b);
            dgamma[d * c + j] += dout[r * c + j] * xhat(j);
            dbeta[d * c + j] += dout[r * c + j];
        }
    }
    (dx, dgamma, dbeta)
}
