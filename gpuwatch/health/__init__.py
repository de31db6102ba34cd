"""The verdict per GPU and node: causes from one sample, memory over time, acknowledgements."""
