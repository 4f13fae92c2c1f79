"""Every limit on the draft length k, in one place (the engine, the k controller, the advisor, the
dashboard and the CLI import these; nothing else states a largest k)."""

K_MAX = 16  # largest fixed k the engine, the CLI and the advisor accept (verification of <= 17 tokens)
K_AUTO_START = 4  # k of the first round of k="auto", before anything is measured
K_AUTO_MAX = 8  # largest k the k="auto" controller may choose (and the largest size `specdec.costs.calibration` calibrates)
K_UI_MAX = 10  # largest k the dashboard offers (its k slider, the theory tab's sweep and axis)
