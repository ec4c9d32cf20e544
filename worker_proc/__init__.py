"""The MLX worker process: owns the device and the model, runs lazy launches."""
