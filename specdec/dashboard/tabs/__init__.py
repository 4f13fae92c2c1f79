"""The dashboard's tabs, one module each: `build(...)` lays out the tab's components and wires their events next
to them; the module's handlers are plain functions from input values to output values.

- `live`: Live decode (rounds streamed as chips, stats, figures, the waterfall and downloads), with `step`, its
  step-through section (one round at a time, one position up close);
- `compare`: Aligned vs unaligned (drafts side by side; preparing and distilling an aligned draft);
- `theory`: Theory vs measurement (the formulas for any α, c, v and a measured k sweep);
- `hardware`: Hardware (why it is faster or slower here: the device, each model's weight format and why, the
  pair's v(n) and c).

`specdec.dashboard.layout` assembles them and wires what spans tabs (the model lists, the API).
"""
