#include "gui/model/icicle.h"

#include <algorithm>
#include <map>
#include <memory>

namespace tidemark::gui {
namespace {

struct Node {
  std::string path, label;
  int64_t own = 0;
  std::string ownCategory;
  int64_t bytes = 0;
  std::string category;
  std::map<std::string, std::unique_ptr<Node>> children;
  std::vector<Node*> ordered;
};

void total(Node& n) {
  n.bytes = n.own;
  int64_t largest = n.ownCategory.empty() ? -1 : n.own;
  n.category = n.ownCategory;
  for (auto& [_, child] : n.children) {
    total(*child);
    n.bytes += child->bytes;
    n.ordered.push_back(child.get());
    if (child->bytes > largest) {
      largest = child->bytes;
      n.category = child->category;
    }
  }
  std::stable_sort(n.ordered.begin(), n.ordered.end(),
                   [](const Node* a, const Node* b) { return a->bytes > b->bytes; });
}

}  // namespace

std::vector<IcicleCell> icicleLayout(const std::vector<IcicleModule>& modules, int64_t totalBytes) {
  Node root;
  for (const IcicleModule& m : modules) {
    if (m.bytes <= 0) continue;
    Node* at = &root;
    size_t begin = 0;
    while (true) {
      const size_t dot = m.name.find('.', begin);
      const std::string part = m.name.substr(begin, dot == std::string::npos ? dot : dot - begin);
      std::unique_ptr<Node>& child = at->children[part];
      if (!child) {
        child = std::make_unique<Node>();
        child->label = part;
        child->path = m.name.substr(0, dot);
      }
      at = child.get();
      if (dot == std::string::npos) break;
      begin = dot + 1;
    }
    at->own += m.bytes;
    if (at->ownCategory.empty()) at->ownCategory = m.category;
  }
  total(root);
  const double whole = static_cast<double>(std::max(totalBytes, root.bytes));
  std::vector<IcicleCell> out;
  if (whole <= 0) return out;
  // Breadth first: a row per depth.
  struct Placed {
    const Node* node;
    double x0;
    int depth;
  };
  std::vector<Placed> level;
  double x = 0;
  for (const Node* n : root.ordered) {
    level.push_back({n, x, 0});
    x += static_cast<double>(n->bytes) / whole;
  }
  // The rest of the moment's memory: in no listed module (outside modules, or below the list's
  // cut), one grey cell at the end of the top row.
  const double rest = 1.0 - x;
  while (!level.empty()) {
    std::vector<Placed> next;
    for (const Placed& p : level) {
      IcicleCell c;
      c.path = p.node->path;
      c.label = p.node->label;
      c.depth = p.depth;
      c.bytes = p.node->bytes;
      c.ownBytes = p.node->own;
      c.x0 = p.x0;
      c.x1 = p.x0 + static_cast<double>(p.node->bytes) / whole;
      c.category = p.node->category;
      out.push_back(std::move(c));
      double cx = p.x0;
      for (const Node* child : p.node->ordered) {
        next.push_back({child, cx, p.depth + 1});
        cx += static_cast<double>(child->bytes) / whole;
      }
    }
    level = std::move(next);
  }
  if (rest > 1e-9 && totalBytes > root.bytes) {
    IcicleCell c;
    c.path = c.label = kIcicleRest;
    c.bytes = c.ownBytes = totalBytes - root.bytes;
    c.x0 = x;
    c.x1 = 1.0;
    out.insert(out.begin() + static_cast<long>(root.ordered.size()), std::move(c));
  }
  return out;
}

}  // namespace tidemark::gui
