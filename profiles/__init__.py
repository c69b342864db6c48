"""Job specs and stage-time models; measured records and fitting; reference workload generators."""
