"""Multi-node runners: each turns a LaunchSpec into the real command lines of an existing engine."""
