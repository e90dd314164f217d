"""What the node is: facts for reports, and (later) probes of its GPUs and topology."""
