# The worker image for compose.yaml (GPU and grade workers, Flower). Build it on the deployment host:
#   docker compose build
# It needs the CUDA build of torch on GPU hosts; pass TORCH_INDEX to pick the wheel index.
FROM python:3.11-slim-bookworm

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu126
RUN apt-get update \
 && apt-get install -y --no-install-recommends git docker.io \
 && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"

WORKDIR /app
COPY . /app
RUN pip install --no-cache-dir -e . flower redis "psycopg[binary]"

# the docker CLI talks to the host engine through the mounted socket (compose.yaml)
ENV PYTHONUNBUFFERED=1
CMD ["nexus-eval", "worker", "--queues", "gpu,grade,default"]
