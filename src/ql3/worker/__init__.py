"""Worker host: agent loop, local crash-barrier journal, control-plane client port."""
