/// Which binary elementwise op (shaders/elementwise.wgsl).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binary {
    /// out = alpha * a + beta * b[i % nb]
    Add,
    /// out = alpha * a * b[i % nb]
    Mul,
}

/// A binary op on D devices: `n` elements of `a` and `out` over all devices (n / D each), and
/// device d's block of `b` (`nb` elements, the period) repeating over its own block of `a`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BinaryArgs {
    pub op: Binary,
    pub n: usize,
    pub nb: usize,
    pub alpha: f32,
    pub beta: f32,
    pub devices: usize,
}

impl BinaryArgs {
    /// `op` over `n` elements on one device, `b` repeating with period `nb`.
    pub fn new(op: Binary, n: usize, nb: usize, alpha: f32, beta: f32) -> Self {
        Self {
            op,
            n,
            nb,
            alpha,
            beta,
            devices: 1,
        }
    }
}

/// out (D, n / D) = `args.op` of a (D, n / D) and each device's b block (D, nb).
pub fn binary(a: &[f32], b: &[f32], args: &BinaryArgs) -> Vec<f32> {
    let nl = args.n / args.devices.max(1);
    (0..args.devices)
        .flat_map(|d| {
            let (a, b) = (&a[d * nl..(d + 1) * nl], &b[d * args.nb..(d + 1) * args.nb]);
            match args.op {
                Binary::Add => add(a, b, args.alpha, args.beta),
                Binary::Mul => mul(a, b, args.alpha),
            }
        })
        .collect()
}

/// `out` with the blocks of the devices `flags` marks (nonzero) set to `value`, each device
/// holding `nl` elements: shaders/elementwise.wgsl's fill_blocks.
pub fn fill_blocks(out: &mut [f32], flags: &[f32], nl: usize, value: f32) {
    for (block, &flag) in out.chunks_mut(nl).zip(flags) {
        if flag != 0.0 {
            block.fill(value);
        }
    }
}

/// out = alpha * a + beta * b[i % b.len()]
pub fn add(a: &[f32], b: &[f32], alpha: f32, beta: f32) -> Vec<f32> {
    a.iter()
        .enumerate()
        .map(|(i, &x)| alpha * x + beta * b[i % b.len()])
        .collect()
}

/// out = alpha * a * b[i % b.len()]
pub fn mul(a: &[f32], b: &[f32], alpha: f32) -> Vec<f32> {
    a.iter().enumerate().map(|(i, &x)| alpha * x * b[i % b.len()]).collect()
}

/// out = alpha * a + beta
pub fn scale(a: &[f32], alpha: f32, beta: f32) -> Vec<f32> {
    a.iter().map(|&x| alpha * x + beta).collect()
}

/// out = value
pub fn fill(n: usize, value: f32) -> Vec<f32> {
    vec![value; n]
}
