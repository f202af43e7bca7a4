"""The compile service: the compiler and its config, worker processes, one attempt's steps, probes, auto planning."""
