"""protege: post-training small vision-language models with reinforcement and imitation learning."""
import os as _os

# Offline by design: nothing at run time may reach the network (telemetry, model hubs).
for _key, _value in {
    "DO_NOT_TRACK": "1",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DVC_NO_ANALYTICS": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    _os.environ.setdefault(_key, _value)

__version__ = "0.1.0"
