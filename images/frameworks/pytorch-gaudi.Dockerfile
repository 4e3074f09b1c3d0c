# pytorch on gaudi (gaudi).
FROM ghcr.io/cascade-ml/base-gaudi:0.1
# the base image already has it
RUN python3 -m pip install transformers==4.46.3 peft==0.13.2 accelerate==1.1.1
COPY . /opt/cascade
RUN python3 -m pip install --no-deps /opt/cascade
USER 1000
