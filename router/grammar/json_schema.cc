// JSON Schema (the draft 2020-12 subset of OpenAI strict mode) to grammar
// rules. Anything that would change which values are valid and is not
// implemented is refused with InvalidArgument naming its path, never
// ignored.
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "router/grammar/grammar_internal.h"
#include "router/request/errors.h"

namespace ringlane::router::grammar {
namespace {

using Json = nlohmann::ordered_json;
using Rule = GrammarBuilder::Rule;

// maxLength / maxItems / minLength / minItems above this expand into too
// many rules; refused rather than silently widened.
constexpr int kMaxBound = 4096;

const absl::flat_hash_set<std::string>& Annotations() {
  static const auto* s = new absl::flat_hash_set<std::string>{
      "description", "title", "default",     "$schema",    "examples", "$id",
      "$comment",    "$defs", "definitions", "deprecated", "readOnly", "writeOnly"};
  return *s;
}

const absl::flat_hash_set<std::string>& Supported() {
  static const auto* s = new absl::flat_hash_set<std::string>{"type",
                                                              "enum",
                                                              "const",
                                                              "properties",
                                                              "required",
                                                              "additionalProperties",
                                                              "items",
                                                              "prefixItems",
                                                              "minItems",
                                                              "maxItems",
                                                              "minLength",
                                                              "maxLength",
                                                              "anyOf",
                                                              "oneOf",
                                                              "allOf",
                                                              "$ref",
                                                              "unevaluatedProperties"};
  return *s;
}

// Names the schema's place as the error's param, as every request field
// error does.
absl::Status Bad(const std::string& path, std::string_view what) { return FieldError(path, what); }

class Compiler {
 public:
  Compiler(internal::RuleSet* b, const Json& root, std::string root_path)
      : b_(b), root_(root), root_path_(std::move(root_path)) {}

  absl::StatusOr<Rule> Compile(const Json& s, const std::string& path) {
    if (s.is_boolean()) {
      if (s.get<bool>()) return b_->GenericValue(0);
      return Bad(path, "the schema false admits no value");
    }
    if (!s.is_object()) return Bad(path, "a schema must be an object or a boolean");
    std::vector<std::string> validating;
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (Annotations().contains(it.key())) continue;
      if (!Supported().contains(it.key())) return Bad(path + "." + it.key(), "not supported");
      validating.push_back(it.key());
    }
    if (auto it = s.find("unevaluatedProperties"); it != s.end()) {
      if (!(it->is_boolean() && !it->get<bool>())) {
        return Bad(path + ".unevaluatedProperties", "not supported (only false)");
      }
    }
    // Combinators and references must stand alone: merging their siblings
    // into each branch is not implemented.
    for (const char* alone : {"$ref", "anyOf", "oneOf", "allOf"}) {
      if (!s.contains(alone)) continue;
      for (const std::string& k : validating) {
        if (k != alone) {
          return Bad(path + "." + k, absl::StrCat("not supported together with ", alone));
        }
      }
      const Json& v = s[alone];
      const std::string p = path + "." + alone;
      if (std::string_view(alone) == "$ref") {
        if (!v.is_string()) return Bad(p, "must be a string");
        return Ref(v.get<std::string>(), p);
      }
      if (!v.is_array() || v.empty()) return Bad(p, "must be a non-empty array of schemas");
      if (std::string_view(alone) == "allOf") {
        if (v.size() != 1) return Bad(p, "only a single element is supported");
        return Compile(v[0], p + "[0]");
      }
      // oneOf is treated as anyOf: a value valid against two branches is
      // accepted, which strict-mode schemas (disjoint branches) never see.
      std::vector<Rule> alts;
      for (size_t i = 0; i < v.size(); ++i) {
        absl::StatusOr<Rule> r = Compile(v[i], absl::StrCat(p, "[", i, "]"));
        if (!r.ok()) return r.status();
        alts.push_back(*r);
      }
      return b_->Alt(std::move(alts));
    }

    std::vector<std::string> types;
    if (auto it = s.find("type"); it != s.end()) {
      const std::string p = path + ".type";
      if (it->is_string()) {
        types.push_back(it->get<std::string>());
      } else if (it->is_array() && !it->empty()) {
        for (const Json& t : *it) {
          if (!t.is_string()) return Bad(p, "must be a type name or an array of type names");
          types.push_back(t.get<std::string>());
        }
      } else {
        return Bad(p, "must be a type name or an array of type names");
      }
      for (const std::string& t : types) {
        if (t != "string" && t != "number" && t != "integer" && t != "boolean" && t != "null" &&
            t != "object" && t != "array") {
          return Bad(p, absl::StrCat("unknown type \"", t, "\""));
        }
      }
    }

    if (s.contains("enum") || s.contains("const")) {
      for (const std::string& k : validating) {
        if (k != "enum" && k != "const" && k != "type") {
          return Bad(path + "." + k, "not supported together with enum or const");
        }
      }
      std::vector<const Json*> values;
      if (auto it = s.find("const"); it != s.end()) values.push_back(&*it);
      if (auto it = s.find("enum"); it != s.end()) {
        if (s.contains("const")) return Bad(path + ".enum", "not supported together with const");
        if (!it->is_array() || it->empty()) return Bad(path + ".enum", "must be a non-empty array");
        for (const Json& v : *it) values.push_back(&v);
      }
      std::vector<Rule> alts;
      for (const Json* v : values) {
        if (!types.empty() && !OfAnyType(*v, types)) continue;
        std::string text;
        try {
          text = v->dump();
        } catch (const nlohmann::json::exception& e) {
          return Bad(path, e.what());
        }
        alts.push_back(b_->Lit(text));
      }
      if (alts.empty()) return Bad(path + ".enum", "no value has the schema's type");
      return b_->Alt(std::move(alts));
    }

    if (types.empty()) {
      // Without a type the keywords present say what is meant.
      if (s.contains("properties") || s.contains("required") ||
          s.contains("additionalProperties")) {
        types.push_back("object");
      } else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") ||
                 s.contains("maxItems")) {
        types.push_back("array");
      } else if (s.contains("minLength") || s.contains("maxLength")) {
        types.push_back("string");
      } else {
        return b_->GenericValue(0);
      }
    }
    std::vector<Rule> alts;
    for (const std::string& t : types) {
      absl::StatusOr<Rule> r = Typed(t, s, path);
      if (!r.ok()) return r.status();
      alts.push_back(*r);
    }
    return alts.size() == 1 ? alts[0] : b_->Alt(std::move(alts));
  }

 private:
  static bool OfAnyType(const Json& v, const std::vector<std::string>& types) {
    for (const std::string& t : types) {
      if ((t == "string" && v.is_string()) || (t == "number" && v.is_number()) ||
          (t == "integer" && v.is_number_integer()) || (t == "boolean" && v.is_boolean()) ||
          (t == "null" && v.is_null()) || (t == "object" && v.is_object()) ||
          (t == "array" && v.is_array())) {
        return true;
      }
    }
    return false;
  }

  // A non-negative integer keyword; `*out` keeps its default when absent.
  absl::Status Bound(const Json& s, const char* key, const std::string& path, int* out) {
    auto it = s.find(key);
    if (it == s.end()) return absl::OkStatus();
    const std::string p = path + "." + key;
    if (!it->is_number_integer() || it->get<int64_t>() < 0) {
      return Bad(p, "must be a non-negative integer");
    }
    if (it->get<int64_t>() > kMaxBound) {
      return Bad(p, absl::StrCat("not supported above ", kMaxBound));
    }
    *out = static_cast<int>(it->get<int64_t>());
    return absl::OkStatus();
  }

  absl::StatusOr<Rule> Typed(const std::string& t, const Json& s, const std::string& path) {
    if (t == "string") {
      int min = 0, max = -1;
      if (absl::Status st = Bound(s, "minLength", path, &min); !st.ok()) return st;
      if (absl::Status st = Bound(s, "maxLength", path, &max); !st.ok()) return st;
      if (max >= 0 && max < min) return Bad(path + ".maxLength", "less than minLength");
      return b_->JsonString(min, max);
    }
    if (t == "number") return b_->JsonNumber();
    if (t == "integer") return b_->JsonInteger();
    if (t == "boolean") return b_->Alt({b_->Lit("true"), b_->Lit("false")});
    if (t == "null") return b_->Lit("null");
    if (t == "object") return Object(s, path);
    return Array(s, path);
  }

  absl::StatusOr<Rule> Object(const Json& s, const std::string& path) {
    const Json* props = nullptr;
    if (auto it = s.find("properties"); it != s.end()) {
      if (!it->is_object()) return Bad(path + ".properties", "must be an object");
      props = &*it;
    }
    absl::flat_hash_set<std::string> required;
    if (auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) return Bad(path + ".required", "must be an array of strings");
      for (const Json& r : *it) {
        if (!r.is_string()) return Bad(path + ".required", "must be an array of strings");
        required.insert(r.get<std::string>());
      }
    }
    const Json* addl = nullptr;
    if (auto it = s.find("additionalProperties"); it != s.end()) addl = &*it;
    const bool addl_false = addl != nullptr && addl->is_boolean() && !addl->get<bool>();
    Rule ws = b_->Ws();

    if ((props == nullptr || props->empty()) && required.empty()) {
      if (addl_false) return b_->Seq({b_->Lit("{"), ws, b_->Lit("}")});
      // No properties and nothing said about others: any object.
      if (addl == nullptr || (addl->is_boolean() && addl->get<bool>())) {
        return b_->GenericObject(0);
      }
      // A map: any keys, every value against the schema.
      absl::StatusOr<Rule> v = Compile(*addl, path + ".additionalProperties");
      if (!v.ok()) return v.status();
      Rule entry = b_->Seq({b_->JsonString(0, -1), ws, b_->Lit(":"), ws, *v});
      Rule entries =
          b_->Seq({entry, b_->Repeat(b_->Seq({b_->Comma(), entry}), 0, -1), ws, b_->Lit("}")});
      return b_->Seq({b_->Lit("{"), ws, b_->Alt({b_->Lit("}"), entries})});
    }
    // With properties, additionalProperties absent counts as false (OpenAI
    // strict mode requires false), so output is the listed keys only.
    if (addl != nullptr && !addl_false) {
      return Bad(path + ".additionalProperties",
                 "not supported together with properties (only false)");
    }
    std::vector<std::pair<std::string, bool>> keys;  // (key, required)
    std::vector<Rule> members;
    if (props != nullptr) {
      for (auto it = props->begin(); it != props->end(); ++it) {
        absl::StatusOr<Rule> v = Compile(it.value(), path + ".properties." + it.key());
        if (!v.ok()) return v.status();
        keys.emplace_back(it.key(), required.contains(it.key()));
        members.push_back(b_->Seq({b_->Lit(Json(it.key()).dump()), ws, b_->Lit(":"), ws, *v}));
      }
    }
    for (const std::string& r : required) {
      if (props == nullptr || !props->contains(r)) {
        return Bad(path + ".required", absl::StrCat("\"", r, "\" is not in properties"));
      }
    }
    // tail[i]: members i.. after at least one was written (each after a
    // comma); first[i]: members i.., at least one, none written yet.
    const int n = static_cast<int>(keys.size());
    Rule tail = b_->Empty();
    Rule first = b_->Dead();
    bool any_required = false;
    for (int i = n - 1; i >= 0; --i) {
      Rule with = b_->Seq({b_->Comma(), members[i], tail});
      Rule start_here = b_->Seq({members[i], tail});
      if (keys[i].second) {
        any_required = true;
        tail = with;
        first = start_here;
      } else {
        tail = b_->Alt({with, tail});
        first = b_->Alt({start_here, first});
      }
    }
    Rule body = b_->Seq({first, ws, b_->Lit("}")});
    Rule inner = any_required ? body : b_->Alt({b_->Lit("}"), body});
    return b_->Seq({b_->Lit("{"), ws, inner});
  }

  absl::StatusOr<Rule> Array(const Json& s, const std::string& path) {
    std::vector<Rule> prefix;
    if (auto it = s.find("prefixItems"); it != s.end()) {
      if (!it->is_array()) return Bad(path + ".prefixItems", "must be an array of schemas");
      for (size_t i = 0; i < it->size(); ++i) {
        absl::StatusOr<Rule> r = Compile((*it)[i], absl::StrCat(path, ".prefixItems[", i, "]"));
        if (!r.ok()) return r.status();
        prefix.push_back(*r);
      }
    }
    // items absent after prefixItems counts as false (no further items),
    // like additionalProperties; with neither, items are any value.
    Rule item = -1;
    if (auto it = s.find("items"); it != s.end()) {
      if (!(it->is_boolean() && !it->get<bool>())) {
        absl::StatusOr<Rule> r = Compile(*it, path + ".items");
        if (!r.ok()) return r.status();
        item = *r;
      }
    } else if (prefix.empty()) {
      item = b_->GenericValue(1);
    }
    int min = 0, max = -1;
    if (absl::Status st = Bound(s, "minItems", path, &min); !st.ok()) return st;
    if (absl::Status st = Bound(s, "maxItems", path, &max); !st.ok()) return st;
    if (max >= 0 && max < min) return Bad(path + ".maxItems", "less than minItems");
    const int k = static_cast<int>(prefix.size());
    if (item < 0 && min > k) return Bad(path + ".minItems", "more than prefixItems allow");
    auto elem = [&](int i) { return i < k ? prefix[i] : item; };
    Rule comma = b_->Comma();
    // next: what may follow once `i` items are written.
    auto tail_from = [&](int i) {
      if (item < 0 || (max >= 0 && i >= max)) return b_->Empty();
      return b_->Repeat(b_->Seq({comma, item}), std::max(0, min - i), max < 0 ? -1 : max - i);
    };
    Rule next = tail_from(std::max(k, 1));
    for (int i = k - 1; i >= 1; --i) {
      std::vector<Rule> alts;
      if (max < 0 || i < max) alts.push_back(b_->Seq({comma, elem(i), next}));
      if (i >= min) alts.push_back(b_->Empty());
      next = b_->Alt(std::move(alts));
    }
    Rule ws = b_->Ws();
    std::vector<Rule> inner;
    if (min == 0) inner.push_back(b_->Lit("]"));
    if (max != 0 && (k > 0 || item >= 0))
      inner.push_back(b_->Seq({elem(0), next, ws, b_->Lit("]")}));
    return b_->Seq({b_->Lit("["), ws, b_->Alt(std::move(inner))});
  }

  // "#" or a JSON pointer into the root ("#/$defs/Name"); each target is
  // compiled once, and a reference to one being compiled (recursion) gets
  // its forward rule.
  absl::StatusOr<Rule> Ref(const std::string& ref, const std::string& path) {
    if (ref.empty() || ref[0] != '#')
      return Bad(path, "only references into this schema (\"#...\") are supported");
    if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
    const Json* target = nullptr;
    std::string target_path = root_path_;
    try {
      Json::json_pointer ptr(ref.substr(1));
      if (root_.contains(ptr)) target = &root_.at(ptr);
      for (const std::string& token :
           ptr.to_string().empty() ? std::vector<std::string>{} : Split(ref.substr(2))) {
        target_path += "." + token;
      }
    } catch (const nlohmann::json::exception&) {
      return Bad(path, absl::StrCat("\"", ref, "\" is not a valid JSON pointer"));
    }
    if (target == nullptr) return Bad(path, absl::StrCat("\"", ref, "\" not found"));
    Rule forward = b_->NewRule();
    refs_[ref] = forward;
    absl::StatusOr<Rule> r = Compile(*target, target_path);
    if (!r.ok()) return r.status();
    b_->AddAlt(forward, {internal::RuleSet::R(*r)});
    return forward;
  }

  static std::vector<std::string> Split(const std::string& s) {
    std::vector<std::string> out(1);
    for (char c : s) {
      if (c == '/') {
        out.emplace_back();
      } else {
        out.back().push_back(c);
      }
    }
    return out;
  }

  internal::RuleSet* b_;
  const Json& root_;
  const std::string root_path_;
  absl::flat_hash_map<std::string, Rule> refs_;
};

}  // namespace

absl::StatusOr<GrammarBuilder::Rule> internal::RuleSet::CompileSchema(
    const nlohmann::ordered_json& schema, std::string_view field_path) {
  const std::string path(field_path);
  Compiler c(this, schema, path);
  return c.Compile(schema, path);
}

}  // namespace ringlane::router::grammar
