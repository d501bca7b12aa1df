"""Examples: CompileCache manifests, a training job and an example JAX workload."""
