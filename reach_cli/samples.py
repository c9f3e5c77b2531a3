"""Sample documents for `reach demo` (written for this project)."""

DOCUMENTS: list[tuple[str, str]] = [
    ("Lighthouses", "Lighthouses once needed a keeper to trim the wick every few hours through the night. "
     "The first automated lights used clockwork to rotate the lens. Electric lamps removed the need "
     "for fuel deliveries to remote rocks. Today most lighthouses are monitored remotely and visited "
     "only for maintenance. Some have been turned into museums or guest houses."),
    ("Sourdough", "Sourdough bread rises because of wild yeast and lactic acid bacteria living together in a "
     "starter. The bacteria produce acids that give the bread its sour taste. A starter must be fed "
     "flour and water regularly to stay active. Bakers often keep the same starter for decades. "
     "Long fermentation also makes the bread keep fresh for longer."),
    ("Tides", "Tides are caused mainly by the gravitational pull of the Moon on the oceans. The Sun adds "
     "a smaller effect, and when both line up the tides are strongest. These are called spring tides. "
     "When the Sun and Moon pull at right angles the range is smallest, giving neap tides. Coastal "
     "shape can amplify tides enormously, as in the Bay of Fundy."),
    ("Bees", "Honey bees communicate the direction of food with a waggle dance. The angle of the dance "
     "relative to vertical shows the direction relative to the Sun. The length of the waggle run "
     "tells the distance. Other foragers follow the dancer and then fly out to the flowers. "
     "The colony can redirect its workforce within hours when a better source appears."),
    ("Rust", "Rust forms when iron reacts with oxygen and water. Salt speeds the reaction, which is why "
     "cars rust faster near the sea or where roads are salted. Paint and oil keep water away from "
     "the metal. Galvanizing coats steel with zinc, which corrodes first and protects the iron. "
     "Stainless steel contains chromium that forms a thin protective oxide layer."),
    ("Glaciers", "Glaciers form where more snow falls in winter than melts in summer. Over years the snow "
     "is compressed into dense ice. Under its own weight the ice flows slowly downhill. Moving "
     "glaciers carve valleys into a U shape and carry rocks far from their source. Many glaciers are "
     "now retreating as average temperatures rise."),
    ("Compost", "Compost is made by microbes breaking down plant material. A good heap mixes green material "
     "rich in nitrogen with brown material rich in carbon. Turning the heap brings in oxygen and "
     "speeds decomposition. A hot heap can reach temperatures that kill weed seeds. The finished "
     "compost improves soil structure and feeds plants slowly."),
    ("Libraries", "Public libraries lend books without charge to anyone in the community. Many also offer "
     "internet access, classes and quiet space to study. Librarians help people find reliable "
     "information. Interlibrary loans let a small branch borrow from a large collection far away. "
     "Digital lending now lets readers borrow e-books from home."),
    ("Bridges", "Suspension bridges hang their deck from cables draped over tall towers. The cables are "
     "anchored in massive blocks at each end. Wind was a serious danger to early designs, which "
     "could twist and oscillate. Modern decks are shaped and stiffened to resist these forces. "
     "The longest spans now exceed two kilometres."),
    ("Owls", "Owls hunt mostly at night using exceptional hearing. Their facial disc funnels sound to "
     "ears that sit at different heights, which helps locate prey in darkness. Soft feather edges "
     "make their flight almost silent. Owls swallow small prey whole and later cough up pellets of "
     "bone and fur. Researchers study pellets to learn what owls eat."),
    ("Volcanoes", "Volcanoes erupt when molten rock rises through the crust and escapes at the surface. "
     "Runny basalt lava forms gentle shield volcanoes. Sticky lava traps gas and can explode "
     "violently. Volcanic ash can disrupt air travel far from the eruption. Over centuries the ash "
     "weathers into some of the most fertile soils on Earth."),
]
