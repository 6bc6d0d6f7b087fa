"""Plain-text tables for the command line, the experiments and benchmarks."""


def print_table(headers, rows):
    """Right-aligned columns; cells are printed with str()."""
    lines = [[str(cell) for cell in row] for row in [headers, *rows]]
    widths = [max(len(line[i]) for line in lines) for i in range(len(headers))]
    for line in lines:
        print("  ".join(cell.rjust(width) for cell, width in zip(line, widths)))


def forced_lines(forced, top=5):
    """``stats()["forced_evaluations"]`` for printing: the total and the
    commonest reads (an evaluation each, so nothing batches across them);
    no lines when nothing was forced."""
    if not forced:
        return []
    commonest = sorted(forced.items(), key=lambda item: -item[1])
    lines = [f"forced evaluations: {sum(forced.values())} (values read before "
             f"tf.build or the scope's end; each evaluates on its own)"]
    lines += [f"  {count} x {site}" for site, count in commonest[:top]]
    if len(commonest) > top:
        lines.append(f"  ... and {len(commonest) - top} more places")
    return lines
