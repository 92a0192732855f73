"""Sources of memory readings. Probes know nothing about pytest."""
