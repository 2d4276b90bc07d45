# kpack-fuse in a container: the program and librocm_kpack installed into a Debian slim image,
# which runs commands with a kernel pack mounted (mount-helpers/container-entrypoint.sh). See
# docs/deploy.md.
#
#   docker build -t kpack-fuse .
#   docker run --rm --device /dev/fuse --cap-add SYS_ADMIN \
#       -v /opt/rocm/lib/kernels.kpack:/kernels.kpack:ro -e KPACK_SOURCE=/kernels.kpack \
#       kpack-fuse ls -R /opt/rocm/lib/kpack
#
# BUILD selects where the program comes from:
#   source (default)  compiled here, in the Rust image;
#   host              a build made on the host and installed into target/container-staging by
#                     `DESTDIR=target/container-staging scripts/install.sh --prefix /usr/local
#                     --sbindir /usr/sbin --from target/release`; the host must have the C
#                     library of the image's Debian release or an older one.
# Only the selected stage is built (BuildKit, Docker's builder since version 23, and podman).
# Either way scripts/install.sh strips what it installs: the image gets no debug information.
#
# On hosts with AppArmor, add --security-opt apparmor:unconfined if the mount is denied.

ARG RUST_VERSION=1.85
ARG DEBIAN_RELEASE=bookworm
ARG BUILD=source

FROM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS build-source
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs rocm_kpack.pc.in ./
COPY src ./src
COPY include ./include
COPY cmake ./cmake
COPY scripts ./scripts
COPY benches ./benches
COPY examples ./examples
RUN cargo build --release --locked --lib --bin kpack-fuse \
 && DESTDIR=/staging scripts/install.sh --prefix /usr/local --sbindir /usr/sbin --from target/release

FROM scratch AS build-host
COPY target/container-staging/ /staging/

FROM build-${BUILD} AS build

FROM debian:${DEBIAN_RELEASE}-slim AS runtime
# fuse3 brings fusermount3 (mounts by non-root users, --auto-unmount) and mount.fuse3.
RUN apt-get update \
 && apt-get install -y --no-install-recommends fuse3 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /staging/ /
COPY mount-helpers/container-entrypoint.sh /usr/local/bin/kpack-container-entrypoint
RUN ldconfig && kpack-fuse --version
ENV KPACK_MOUNTPOINT=/opt/rocm/lib/kpack \
    KPACK_MOUNT_OPTIONS=ro
ENTRYPOINT ["/usr/local/bin/kpack-container-entrypoint"]
CMD ["sh", "-c", "ls -R \"$KPACK_MOUNTPOINT\""]
