/// A host-side array of 4-byte elements: what goes into and comes out of a program.
#[derive(Clone, Debug, PartialEq)]
pub enum Tensor {
    F32(Vec<f32>),
    U32(Vec<u32>),
}

impl Tensor {
    pub fn len(&self) -> usize {
        match self {
            Tensor::F32(v) => v.len(),
            Tensor::U32(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn f32(&self) -> &[f32] {
        match self {
            Tensor::F32(v) => v,
            Tensor::U32(_) => panic!("expected an f32 tensor"),
        }
    }

    pub fn u32(&self) -> &[u32] {
        match self {
            Tensor::U32(v) => v,
            Tensor::F32(_) => panic!("expected a u32 tensor"),
        }
    }

    pub fn into_f32(self) -> Vec<f32> {
        match self {
            Tensor::F32(v) => v,
            Tensor::U32(v) => v.into_iter().map(|x| x as f32).collect(),
        }
    }

    /// The first element as f32 (a scalar loss).
    pub fn scalar(&self) -> f32 {
        match self {
            Tensor::F32(v) => v[0],
            Tensor::U32(v) => v[0] as f32,
        }
    }

    /// Block `d` of `devices` equal blocks (`[device, local...]` layout).
    pub fn block(&self, d: usize, devices: usize) -> Tensor {
        let n = self.len() / devices;
        match self {
            Tensor::F32(v) => Tensor::F32(v[d * n..(d + 1) * n].to_vec()),
            Tensor::U32(v) => Tensor::U32(v[d * n..(d + 1) * n].to_vec()),
        }
    }

    /// Zeros of one value's (local) shape and dtype.
    pub fn zeros(info: &crate::ir::ValueInfo) -> Tensor {
        match info.dtype {
            crate::ir::DType::F32 => Tensor::F32(vec![0.0; info.numel()]),
            crate::ir::DType::U32 => Tensor::U32(vec![0; info.numel()]),
        }
    }

    /// This array with block `d` of `devices` equal blocks set to zero.
    pub fn zero_block(mut self, d: usize, devices: usize) -> Tensor {
        let n = self.len() / devices;
        match &mut self {
            Tensor::F32(v) => v[d * n..(d + 1) * n].fill(0.0),
            Tensor::U32(v) => v[d * n..(d + 1) * n].fill(0),
        }
        self
    }

    /// Blocks one after another (all of one dtype).
    pub fn concat<'a>(blocks: impl Iterator<Item = &'a Tensor>) -> Tensor {
        let blocks: Vec<&Tensor> = blocks.collect();
        match blocks.first() {
            Some(Tensor::U32(_)) => Tensor::U32(blocks.iter().flat_map(|b| b.u32().iter().copied()).collect()),
            _ => Tensor::F32(blocks.iter().flat_map(|b| b.f32().iter().copied()).collect()),
        }
    }
}
