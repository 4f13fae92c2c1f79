"""What a round costs on this machine: calibration of v(n) and c, the k advisor, the waterfall."""
