"""The compiled CPU kernels (C sources, compiled once per machine) and their bindings."""
