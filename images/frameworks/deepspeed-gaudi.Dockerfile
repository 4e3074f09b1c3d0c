# deepspeed on gaudi (gaudi).
FROM ghcr.io/cascade-ml/base-gaudi:0.1
RUN python3 -m pip install git+https://github.com/HabanaAI/DeepSpeed.git@1.18.0
COPY . /opt/cascade
RUN python3 -m pip install --no-deps /opt/cascade
USER 1000
