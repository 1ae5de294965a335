#pragma once

#include "server/rpc/access.h"
#include "server/rpc/token_book.h"
#include "tidemark/v1/admin.grpc.pb.h"

namespace tidemark::server {

// Token management (proto/tidemark/v1/admin.proto), for the daemon's own user and root.
class AdminService final : public v1::Admin::Service {
 public:
  AdminService(TokenBook& tokens, const Access& access) : m_tokens(tokens), m_access(access) {}

  grpc::Status CreateToken(grpc::ServerContext* ctx, const v1::CreateTokenRequest* request,
                           v1::CreateTokenResponse* response) override;
  grpc::Status ListTokens(grpc::ServerContext* ctx, const v1::ListTokensRequest* request,
                          v1::ListTokensResponse* response) override;
  grpc::Status RevokeToken(grpc::ServerContext* ctx, const v1::RevokeTokenRequest* request,
                           v1::RevokeTokenResponse* response) override;

 private:
  TokenBook& m_tokens;
  const Access& m_access;
};

}  // namespace tidemark::server
