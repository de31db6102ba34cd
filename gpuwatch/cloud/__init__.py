"""What a cloud tells a VM before it takes it away: spot and preemptible reclaims, and
maintenance a GPU VM cannot live through, read from the provider's metadata service."""
