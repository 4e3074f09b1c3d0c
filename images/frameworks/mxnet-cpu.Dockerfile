# mxnet on cpu (cpu).
FROM ghcr.io/cascade-ml/base-cpu:0.1
RUN python3 -m pip install mxnet==1.9.1
COPY . /opt/cascade
RUN python3 -m pip install --no-deps /opt/cascade
USER 1000
