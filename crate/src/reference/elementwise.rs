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
