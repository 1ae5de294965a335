# embed_text(OUT_CPP INPUT NAMESPACE SYMBOL): writes a .cpp defining
# `extern const char* const NAMESPACE::SYMBOL` holding the text of INPUT.
function(embed_text out_cpp input namespace symbol)
  file(READ ${input} content)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${input})
  file(WRITE ${out_cpp}.tmp
    "// Generated from ${input}; do not edit.\nnamespace ${namespace} {\n"
    "extern const char* const ${symbol};\n"
    "const char* const ${symbol} = R\"tidemark_embed(${content})tidemark_embed\";\n}\n")
  file(COPY_FILE ${out_cpp}.tmp ${out_cpp} ONLY_IF_DIFFERENT)
endfunction()
