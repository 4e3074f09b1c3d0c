# paddle on cpu (cpu).
FROM ghcr.io/cascade-ml/base-cpu:0.1
RUN python3 -m pip install paddlepaddle==2.6.2
COPY . /opt/cascade
RUN python3 -m pip install --no-deps /opt/cascade
USER 1000
