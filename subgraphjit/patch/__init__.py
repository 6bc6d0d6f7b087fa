"""Recording: the op table, the patched wrappers, and VirtualNode."""
