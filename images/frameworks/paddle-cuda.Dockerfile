# paddle on nvidia (cuda).
FROM ghcr.io/cascade-ml/base-cuda:0.1
RUN python3 -m pip install paddlepaddle-gpu==2.6.2
COPY . /opt/cascade
RUN python3 -m pip install --no-deps /opt/cascade
USER 1000
