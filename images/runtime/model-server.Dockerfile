# The platform's model-server process.
FROM ghcr.io/cascade-ml/base-cpu:0.1
COPY . /opt/cascade
RUN python3 -m pip install /opt/cascade
USER 1000
EXPOSE 8080
CMD ["python", "-m", "cascade.serving.modelserver"]
