"""specdec dashboard: `python app.py` (also the Hugging Face Space entry point, see the README's front matter).

Configured by environment variables (SPECDEC_HOST, SPECDEC_PORT, SPECDEC_ALLOWED_MODELS, SPECDEC_TIME_LIMIT_S, ...):
every one, with its default, is in docs/hosting.md; specdec/dashboard/config.py reads them.
"""
from specdec.dashboard.config import AppConfig
from specdec.dashboard.layout import build_demo, launch_options

config = AppConfig.from_env()
demo = build_demo(config)

if __name__ == "__main__":
    demo.launch(**launch_options(config))
