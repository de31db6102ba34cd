"""The job-end report: what happened to each GPU while a job ran on it."""
