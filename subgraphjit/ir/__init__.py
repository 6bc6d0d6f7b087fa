"""The recorded program: VirtualNode, the op table and its rows, output
specs, and the generated wrappers that record a node per op (record.py)."""
