"""What every output is made of, whichever workflow writes it: files written whole (`files`),
strict JSON, figures and terminal tables (`text`), the self-contained HTML page (`page`) and its
SVG charts (`chart`). Nothing here knows a run, a capacity plan or a protocol; they import it.
"""
