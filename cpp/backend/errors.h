// The two ways a request is refused: its layout is wrong (InputError) or it is beyond a limit
// (LimitError). Either becomes the request's error response; the server goes on.
#pragma once

#include <stdexcept>
#include <string>

namespace hstu {

struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct LimitError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace hstu
