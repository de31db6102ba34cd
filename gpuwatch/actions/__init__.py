"""What gpuwatch does to the node on its own, when the operator opts in: draining it in Slurm."""
