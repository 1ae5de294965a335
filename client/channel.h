#pragma once

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

namespace tidemark::client {

// How a client (the agent, the CLI, the GUI) reaches tidemarkd.
struct ChannelOptions {
  std::string target;  // "unix:PATH" or "HOST:PORT"
  std::string token;   // presented on every call as "authorization: Bearer <token>" ("": none)
};

// A channel to the daemon; every call on it carries the token (docs/security.md).
std::shared_ptr<grpc::Channel> makeChannel(const ChannelOptions& options);

}  // namespace tidemark::client
