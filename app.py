"""specdec dashboard: `python app.py` (also the Hugging Face Space entry point, see README front matter).

Configuration by environment variables (SPECDEC_HOST, SPECDEC_PORT, or Gradio's GRADIO_SERVER_NAME and
GRADIO_SERVER_PORT; SPECDEC_ALLOWED_MODELS,
SPECDEC_ALLOW_CUSTOM_MODELS, SPECDEC_MAX_NEW_TOKENS, SPECDEC_CONCURRENCY, SPECDEC_DTYPE,
SPECDEC_TARGET, SPECDEC_DRAFT): see specdec/dashboard/config.py.
"""
from specdec.dashboard.config import AppConfig
from specdec.dashboard.layout import build_demo, launch_options

config = AppConfig.from_env()
demo = build_demo(config)

if __name__ == "__main__":
    demo.launch(**launch_options(config))
