"""Each physical GPU's life on this node, by serial number: what it went through, kept
across restarts, reboots, driver upgrades and moves between slots."""
