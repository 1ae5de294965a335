#pragma once

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

namespace tidemark::client {

// How a client (the agent, the CLI, the GUI) reaches tidemarkd.
struct ChannelOptions {
  std::string target;  // "unix:PATH" or "HOST:PORT"
  std::string token;   // presented on every call as "authorization: Bearer <token>" ("": none)
  // TLS, when tlsCa is set: the PEM files of the CA that signed the daemon's certificate and,
  // for a daemon that asks for one (tidemarkd --tls-client-ca), this client's certificate and key.
  std::string tlsCa;
  std::string tlsCert;
  std::string tlsKey;

  // TIDEMARK_TOKEN / TIDEMARK_TOKEN_FILE and TIDEMARK_TLS_CA / _CERT / _KEY for target.
  static ChannelOptions fromEnvironment(std::string target);
};

// A channel to the daemon: TLS when tlsCa is set (the daemon's certificate verified against it),
// else plain (a Unix socket or loopback); every call on it carries the token (docs/security.md).
// nullptr, with *error saying why, when a PEM file named cannot be read.
std::shared_ptr<grpc::Channel> makeChannel(const ChannelOptions& options, std::string* error);

}  // namespace tidemark::client
