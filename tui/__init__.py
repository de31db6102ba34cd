"""The Textual dashboard (imported as gpuwatch.tui); built in the dashboard issue."""
