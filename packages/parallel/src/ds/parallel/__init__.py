"""Device mesh, tensor parallelism (AutoTP) and Ulysses sequence parallelism."""
