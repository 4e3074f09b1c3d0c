# deepspeed on nvidia (cuda).
FROM ghcr.io/cascade-ml/base-cuda:0.1
RUN python3 -m pip install torch==2.4.1 deepspeed==0.15.1
COPY . /opt/cascade
RUN python3 -m pip install --no-deps /opt/cascade
USER 1000
