"""Plain-text tables for the command line, the experiments and benchmarks."""


def print_table(headers, rows):
    """Right-aligned columns; cells are printed with str()."""
    lines = [[str(cell) for cell in row] for row in [headers, *rows]]
    widths = [max(len(line[i]) for line in lines) for i in range(len(headers))]
    for line in lines:
        print("  ".join(cell.rjust(width) for cell, width in zip(line, widths)))
