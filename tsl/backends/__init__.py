"""Built-in back ends: cpu, vta, tpu, cuda_tensorcore. None imports another."""
