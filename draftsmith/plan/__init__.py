"""The run's plan, made before any job: what the data will weigh on disk, the GPU-hours of each stage, and
the rounds that keep the hidden states under a disk budget (`extract.disk_budget`)."""
