"""What only the CPU backend needs: the BLAS library and its threads (`blas`, `blas_threads`) and
faster activations (`activations`)."""
